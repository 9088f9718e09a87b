"""ForkLab's regression evals as ``braintrust.Eval`` suites: causal (the analysis on
crafted outcome tables), capacity (quota, region and snapshot refusals) and acquisition
(the guard policy and power planning). Each suite takes the policy it judges as an
argument, so a test can prove the suite fails a deliberately broken one. They run locally
with no key (``no_send_logs``); ``forklab evals`` uploads them when a key is set.
"""
