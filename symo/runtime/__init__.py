"""The runtime: a compiled spec (`CompiledSpec`), the commutant algebra it acts in (`Curvature`), and the
matrix functions of its small factors (`linalg`: one eigh path, one Newton–Schulz).

Room 1 of docs/architecture.md: imports only from `symo.compiler` (room 0).
"""
