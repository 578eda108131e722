"""`mlx-dflash bench`: DFlash against stock mlx_lm on the same tokens, same process.

runner.py drives the runs, engine.py is the engine-efficiency drafter, shapes.py
builds random targets of real shapes, suites.py the prompts, stats.py and
report.py the numbers and the files.
"""
