#!/bin/sh
# The python that runs the browser tests (tests/e2e/test_ui_browser*.py): the venv that
# ./setup.sh makes from tests/ui/requirements.txt (Playwright). Without it the tests fail here,
# saying what to do; they are never skipped.
python=/var/cache/shoal/venvs/browser/bin/python
if [ ! -x "$python" ]; then
  echo "$python is missing: run ./setup.sh (it makes the browser tests' venv from tests/ui/requirements.txt)" >&2
  exit 1
fi
exec "$python" "$@"
