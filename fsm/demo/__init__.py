"""``fsm demo``: the whole story of the seeds, with real processes (see :mod:`fsm.demo.cli`)."""
