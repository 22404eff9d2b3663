"""The peer in `bench/serve_peers.py`: the LitServe app a user would write from LitServe's
README, one `LitAPI` per server on its default path `/predict` (ONNX Runtime session with its
default threads, PIL preprocessing, `max_batch_size=16`), every other setting LitServe's
default: among them the gzip of replies over 1,000 bytes to clients that accept it, which
LitServer adds unless an API streams (aiohttp, like requests and httpx, asks for gzip).
`images`: a multipart field `file`; `tensors`: JSON `{"tensor": base64 FP32 bytes, "shape":
[...]}`, answered with base64 FP32 logits (LitServe has no binary-tensor protocol; base64 in
JSON is the equivalent of zoo's binary KServe v2 tensors on both sides). One server per kind,
as a user serving one kind of request runs one: a second API in the same server would add a
worker that polls its queue on the same cores.

    python bench/peers/litserve_app.py MODEL.onnx PORT images|tensors
"""

import base64
import json
import sys

import litserve as ls
import numpy as np
import onnx
import onnxruntime as ort
from PIL import Image

MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def session(path: str) -> tuple[ort.InferenceSession, list[str]]:
    props = {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}
    labels = json.loads(props.get("zoo", "{}")).get("class_names", [])
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"]), labels


def top5(logits: np.ndarray, labels: list[str]) -> dict:
    e = np.exp(logits - logits.max())
    p = e / e.sum()
    idx = np.argsort(-p)[:5]
    return {
        "predictions": [
            {
                "label": labels[i] if i < len(labels) else str(i),
                "index": int(i),
                "score": float(p[i]),
            }
            for i in idx
        ]
    }


class ImageAPI(ls.LitAPI):
    def setup(self, device):
        self.sess, self.labels = session(sys.argv[1])

    def decode_request(self, request):
        im = Image.open(request["file"].file).convert("RGB")
        w, h = im.size
        s = 256 / min(w, h)
        im = im.resize((int(w * s), int(h * s)), Image.BILINEAR)
        left, top = (im.width - 224) // 2, (im.height - 224) // 2
        im = im.crop((left, top, left + 224, top + 224))
        x = (np.asarray(im, np.float32) / 255 - MEAN) / STD
        return x.transpose(2, 0, 1)

    def batch(self, inputs):
        return np.stack(inputs)

    def predict(self, x):
        return self.sess.run(None, {self.sess.get_inputs()[0].name: x})[0]

    def unbatch(self, output):
        return list(output)

    def encode_response(self, output):
        return top5(output, self.labels)


class TensorAPI(ImageAPI):
    def decode_request(self, request):
        raw = base64.b64decode(request["tensor"])
        return np.frombuffer(raw, np.float32).reshape(request["shape"])[0]

    def encode_response(self, output):  # binary logits, as zoo answers: base64 FP32
        return {"logits": base64.b64encode(output.astype(np.float32).tobytes()).decode()}


if __name__ == "__main__":
    api = {"images": ImageAPI, "tensors": TensorAPI}[sys.argv[3]](max_batch_size=16)
    ls.LitServer(api, accelerator="cpu").run(port=int(sys.argv[2]), generate_client_file=False)
