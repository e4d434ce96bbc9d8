"""The bundled symmetry specs (TOML files), installed as package data so they resolve by name.

`symo.load_spec("gpt_muon")` finds `gpt_muon.toml` here from any working directory.
"""
