r"""Pure math: one module per paper, plus the sampled-Gaussian helper and the
composition baselines.

Each paper's math is a function of plain numbers and returns Renyi-DP epsilons
(in nats) at the requested orders, or a privacy profile. Nothing there validates
user input, checks preconditions or imports a framework: that is the job of
:mod:`lastiter_plugins.registry` and :mod:`lastiter_plugins.config`. Paper symbols
are used inside these modules only. Each paper module ends with its glue: typed
functions of a TrainingConfig and LossAssumptions (signatures in
:mod:`lastiter_plugins.bounds._glue`) mapping DP-SGD hyperparameters to the
paper's symbols, which the registry table names. Nothing here imports the registry.
Shared lemmas and sizes (the gradient step's contraction, the non-expansive step
size, the batch sizes of a pass) are in :mod:`lastiter_plugins.bounds._common`.
"""
