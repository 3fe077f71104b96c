"""The seed APIs (metta, ROSE, rsl_rl, objectrl, TorchRL) as thin front-ends on xpbank.

Each submodule is imported on its own (``from xpbank.compat.rsl_rl import
RolloutStorage``); none is imported here, so no optional dependency loads by accident.
"""
