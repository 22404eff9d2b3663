"""Turn a registry entry or a fine-tuned run into something that runs without PyTorch, and
prove it is the same model: ONNX export with parity, TorchScript/torch.export comparison,
quantization, latency benchmarks, prediction and serving."""
