"""The model card template (template.md), installed as `vaswani_hf.model_cards`; examples/ holds rendered cards."""
