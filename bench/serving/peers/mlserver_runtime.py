"""MLServer custom runtime of bench/serving_peers.py: a TorchScript model behind MLServer's v2
API. MLServer's adaptive batching stacks the requests along the first dimension before predict
and splits the outputs after it."""

import torch
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class TorchScriptModel(MLModel):
    async def load(self) -> bool:
        torch.set_num_threads(1)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass
        self._module = torch.jit.load(self.settings.parameters.uri, map_location="cpu")
        self._module.eval()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        with torch.inference_mode():
            y = self._module(torch.from_numpy(x))
        return InferenceResponse(model_name=self.name, outputs=[
            NumpyCodec.encode_output(name="output", payload=y.numpy())])
