"""Attribute and instrument names: OpenTelemetry's semantic conventions where one fits.

A claim is a consumer taking messages from a queue, so claims and handlers carry the
``messaging.*`` attributes (``messaging.system`` is ``"fsm"``, the destination is the
lifecycle's kind) and are counted by the conventions' ``messaging.client.consumed.messages``
and timed by ``messaging.process.duration``.  What no convention names (a fencing token, a
lifecycle event) is namespaced ``fsm.*``.  Failures carry ``error.type``.
"""

from __future__ import annotations

SYSTEM = "fsm"
"""``messaging.system`` of every claim and handler."""

# -- OpenTelemetry semantic conventions ---------------------------------------------------
MESSAGING_SYSTEM = "messaging.system"
MESSAGING_DESTINATION = "messaging.destination.name"
MESSAGING_OPERATION_TYPE = "messaging.operation.type"
MESSAGING_OPERATION_NAME = "messaging.operation.name"
MESSAGING_MESSAGE_ID = "messaging.message.id"
MESSAGING_BATCH_COUNT = "messaging.batch.message_count"
MESSAGING_CONSUMER_GROUP = "messaging.consumer.group.name"
ERROR_TYPE = "error.type"

# -- ours ---------------------------------------------------------------------------------
KIND = "fsm.kind"
EVENT = "fsm.event"
ACTOR = "fsm.actor"
ENTITY = "fsm.entity.id"
OWNER = "fsm.lease.owner"
TOKEN = "fsm.lease.token"
SOURCE = "fsm.state.source"
TARGET = "fsm.state.target"
STATE = "fsm.state"
VERSION = "fsm.version"
OUTCOME = "fsm.outcome"
EFFECT_KEY = "fsm.effect.key"
OPERATION = "fsm.operation"
REPLAYED = "fsm.replayed"

# -- instrument names (Prometheus: dots become underscores, counters end in _total) -------
TRANSITIONS = "fsm.transitions"
CLAIMED = "messaging.client.consumed.messages"
CLAIM_LATENCY = "fsm.claim.latency"
PROCESS_DURATION = "messaging.process.duration"
EFFECT_DURATION = "fsm.effect.duration"
RENEWALS = "fsm.lease.renewals"
LAPSES = "fsm.lease.lapses"
REFUSED = "fsm.writes.refused"
RETRIES = "fsm.retries"
REAPER_MOVES = "fsm.reaper.moves"
REAPER_LOST_RACES = "fsm.reaper.lost_races"
REAPER_BAD_ROWS = "fsm.reaper.bad_rows"
REAPER_TICK_DURATION = "fsm.reaper.tick.duration"

__all__ = [name for name in dir() if name.isupper()]
