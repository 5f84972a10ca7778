"""gpufleet-lab: the placement simulator, the decision-vector generator and ``make lab``'s own steps.

A user of the extender (``gpufleet_extender``: its scoring, settings and pod reader) and of the collection's
library (``plugins/module_utils``, shipped in this package as ``gpufleet_lab.mig_utils``), never a part of either:
the extender's wheel and its serve image hold the server alone.
"""

__version__ = "0.1.0"
