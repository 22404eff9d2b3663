"""``zoo serve``: an Open Inference Protocol (KServe v2) server for ONNX Runtime models, with
dynamic batching, limits, health that tells the truth, Prometheus metrics and graceful
shutdown."""
