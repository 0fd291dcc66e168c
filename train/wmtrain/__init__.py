"""wmtrain: trainer, exporter and golden-fixture generator for wmserve's cldit world model.

Modules: config (config.json), model (CLDiT), noise (engine/noise.h in numpy),
safetensors (reader/writer), data (episodes, clips, synthetic data), sample
(the engine's sampling loop and evaluation), train (CLI), export (model dirs),
golden (the parity fixture).
"""

__version__ = "0.1.0"
