# Sourced by sanitize/run.sh and fuzz/run.sh, whose builds are whole trees of their own: their
# objects are cached by ccache in a fixed folder every clone shares (as setup.sh's Python
# environments are), so a second run of the README's test command rebuilds only what changed.
# A cache the user chose (CCACHE_DIR, or cache_dir in ccache's configuration) is left alone.
# CCACHE_BASEDIR makes the keys independent of where the clone lies.
if command -v ccache >/dev/null && [ -z "${CCACHE_DIR:-}" ] &&
   ccache --show-config 2>/dev/null | grep -q '^(default) cache_dir '; then
  # Only where this user may write (setup.sh makes /var/cache/shoal as root; a user without
  # sudo keeps ccache's own default).
  if mkdir -p /var/cache/shoal/ccache 2>/dev/null && [ -w /var/cache/shoal/ccache ]; then
    export CCACHE_DIR=/var/cache/shoal/ccache
  fi
fi
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
