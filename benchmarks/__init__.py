"""The benchmark scripts, one per results file in benchmarks/results/.

Run each from the repository root as a module, e.g. `python -m benchmarks.matrix_sensing`; being a
package lets the scripts share code (`from benchmarks import sensing_core`) and lets the tests import
their pieces the same way. Each script imports the installed `symo` package.
"""
