"""Testing helpers for lifecycles.

The modules here build on hypothesis, a test dependency only: this package face imports
none of them, so ``import fsm.testing`` (or anything in fsm's normal import path) never
needs hypothesis.  Import :mod:`fsm.testing.lifecycles` explicitly in tests.
"""
