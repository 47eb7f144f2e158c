"""Ready-made experiments (``python -m spherepde.experiments.<name>``).

default
    The experiment of ``make run``: the paper's setting at a modest resolution (docs/examples/
    paper_attention.toml), with its results file and figures.
"""
