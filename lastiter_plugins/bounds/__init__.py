r"""Pure math: one module per paper, plus the sampled-Gaussian helper and the
composition baselines.

Everything here is a function of plain numbers and returns Renyi-DP epsilons
(in nats) at the requested orders. Nothing here validates user input, checks
preconditions or imports a framework: that is the job of
:mod:`lastiter_plugins.registry` and :mod:`lastiter_plugins.config`.
Paper symbols are used inside these modules only; the mapping from DP-SGD
hyperparameters is done once, in :mod:`lastiter_plugins.registry`.
"""
