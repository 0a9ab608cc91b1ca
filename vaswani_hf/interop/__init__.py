"""Other engines and places: export to CTranslate2 and ONNX, converters from Marian and torch.nn.Transformer, the
Hub (model card, push)."""
