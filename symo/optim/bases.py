"""The eigenbasis refreshes (`Eigh`, `PowerQR`), kept importable here; every matrix-function config lives in
symo.optim.matrix_function_configs."""

from __future__ import annotations

from .matrix_function_configs import BasisRefresh, Eigh, PowerQR

__all__ = ["BasisRefresh", "Eigh", "PowerQR"]
