"""One line each: the training frameworks' own hooks, reporting to the harness.

``harness.integrations.transformers.ElasticCallback`` for Hugging Face's ``Trainer``,
``harness.integrations.accelerate.ElasticAccelerator`` for an Accelerate loop. Each
module imports its framework (install it with ``pip install pytest-elastic[transformers]``)
and nothing of it is imported until that module is; each is a no-op outside the harness,
so a script keeps the line when it trains for real.
"""
