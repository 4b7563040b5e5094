"""Learning algorithms and classical heads; each module registers itself with marl_q's registries.

marl_q's plugin index reads every module of this package (marl_q/plugins.py), so adding an algorithm
touches only its own file; a module is imported when a config names what it registers.
"""
