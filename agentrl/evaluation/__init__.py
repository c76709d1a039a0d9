"""Evaluation on held-out tasks: its one owner.

* :mod:`~agentrl.evaluation.report`: the scores (pass@k, avg@k) and
  :class:`EvalReport`, ``results.json``.
* :mod:`~agentrl.evaluation.runner`: ``agentrl eval``'s run (a rollout of kind "eval",
  then the report) and the config it runs under.
* :mod:`~agentrl.evaluation.periodic`: the evaluations inside ``agentrl train``
  (before, every ``eval.every`` steps beside training, after).
* :mod:`~agentrl.evaluation.summary`: the row of one of those and its line.

The command line is :mod:`agentrl.cli.eval`; :mod:`agentrl.run` records the rows.
"""

from agentrl.evaluation.periodic import DURING, PeriodicEval, evaluate
from agentrl.evaluation.report import (
    EVAL_KIND,
    RESULTS_FILE,
    EvalReport,
    TaskResult,
    eval_report,
    pass_at_k,
    reported_ks,
)
from agentrl.evaluation.runner import check_k, eval_config, run_eval, write_report
from agentrl.evaluation.summary import eval_line, eval_summary

__all__ = [
    "DURING",
    "EVAL_KIND",
    "RESULTS_FILE",
    "EvalReport",
    "PeriodicEval",
    "TaskResult",
    "check_k",
    "eval_config",
    "eval_line",
    "eval_report",
    "eval_summary",
    "evaluate",
    "pass_at_k",
    "reported_ks",
    "run_eval",
    "write_report",
]
