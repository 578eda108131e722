"""`mlx-dflash bench`: DFlash against stock mlx_lm on the same tokens, same process.

cli.py reads the flags, arms.py builds the target and the arms from them,
runner.py drives the runs (cycle_profile.py times the cycle's parts), engine.py
is the engine-efficiency drafter, shapes.py builds random targets of real shapes,
suites.py the prompts, stats.py and pooled.py the numbers, report.py the files
(plot.py the PNG, environment.py what it ran on).
"""
