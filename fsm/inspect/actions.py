"""Operator actions (opt-in: ``fsm inspect --allow-actions``, always behind the token).

An action is a **declared** ``operator_override`` transition of the entity's lifecycle
(:func:`fsm.definition_rules.operator_override`), fired from the entity's page: a
lifecycle that declares ``cancel = operator_override(queued.to(failed) |
active.running.to(failed))`` gets a *cancel* button on its queued and running entities,
one that declares ``release = operator_override(active.finalizing.to.itself(),
lease=LeaseChange.CLEAR)`` a *release lease* button (the holder is fenced: its next write
finds no lease).  Nothing the lifecycle does not declare can be done from the page, and
each action is a transition in history like any other, its reason naming the operator:
``operator alice: stuck since the deploy``.

A failed entity is never moved (I5): one whose lifecycle declares a *resubmit*
(``operator_override(queued.to.itself())``) gets a *retry* button that creates a new
entity with its data, the resubmit its first transition (:mod:`fsm.inspect.retry`).

Every action is a POST carrying:

- ``csrf``: a token bound to the session (or the bearer), an HMAC of the inspector's
  secret; a page of another site cannot read it, and the session cookie is
  ``SameSite=Strict`` besides; an ``Origin`` header, when sent, must be this page's;
- ``version``: the version the operator saw; a transition committed since makes the action
  refuse (409), so nobody cancels an entity that has moved on without seeing it;
- ``operator``: who acts (required, recorded), and ``note`` (optional, recorded).

Without ``--allow-actions`` the routes do not exist and the page stays GET-only.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from fsm.errors import FsmError
from fsm.inspect.timeline import esc
from fsm.records import LeaseChange, Snapshot

ACTION_PATH = "/action"

RETRY = "retry-as-new"
"""The retry action's ``event`` field: not an event name (a hyphen), so no lifecycle's."""


@dataclass(frozen=True)
class Action:
    """One declared override the operator may fire from the entity's current state."""

    event: str
    target: str
    label: str


def actions_for(lifecycle: Any, snap: Snapshot) -> list[Action]:
    """The declared operator overrides out of the entity's current configuration; for a
    failed entity whose lifecycle declares a resubmit, the retry (as a new entity)."""
    from fsm.inspect import retry

    resubmit = retry.resubmit_event(lifecycle)
    if snap.deleted:
        return []
    if snap.state in lifecycle.table.finals:
        if resubmit is None or snap.state not in retry.retryable_states(lifecycle):
            return []
        try:
            new_id = retry.retry_id(snap.id)
        except FsmError:
            return []
        return [Action(RETRY, lifecycle.table.initial, f"retry as a new entity ({new_id})")]
    active = set(lifecycle.table.configurations.get(snap.state, (snap.state,)))
    found: dict[str, Action] = {}
    for branch in lifecycle.table.declared:
        if not branch.override or (branch.source not in active and branch.declared_on not in active):
            continue
        if branch.event in found or branch.event == resubmit:  # a resubmit records a retry's creation only
            continue
        if branch.target in lifecycle.table.finals:  # entering a final state clears the lease anyway
            label = f"{branch.event} (to {branch.target})"
        elif branch.lease_effect is LeaseChange.CLEAR and branch.target == branch.source:
            label = "release the lease"
        elif branch.lease_effect is LeaseChange.CLEAR:
            label = f"release the lease (back to {branch.target})"
        else:
            label = f"{branch.event} (to {branch.target})"
        found[branch.event] = Action(branch.event, branch.target, label)
    return list(found.values())


def csrf_token(secret: str, who: str) -> str:
    """The form token of one session (or of the bearer): an HMAC, never stored."""
    return hmac.new(secret.encode(), f"csrf:{who}".encode(), hashlib.sha256).hexdigest()


def same_origin(origin: str | None, host: str | None) -> bool:
    """Whether a request's ``Origin`` (when sent) names the host it was sent to."""
    if not origin:
        return True
    if origin == "null" or host is None:
        return False
    return urlsplit(origin).netloc.lower() == host.lower()


def actions_section(snap: Snapshot, actions: list[Action], csrf: str) -> str:
    """The entity page's action forms (one POST per declared override)."""
    if not actions:
        return (
            "<section class=actions><h2>Operator actions</h2><p class=empty>No operator override is declared "
            "out of this state (<code>operator_override(...)</code> in the lifecycle).</p></section>"
        )
    forms = []
    for a in actions:
        forms.append(
            f"<form class=action method=post action='{ACTION_PATH}' data-event='{esc(a.event)}'>"
            f"<input type=hidden name=id value='{esc(snap.id)}'>"
            f"<input type=hidden name=event value='{esc(a.event)}'>"
            f"<input type=hidden name=version value='{snap.version}'>"
            f"<input type=hidden name=csrf value='{esc(csrf)}'>"
            "<label>operator <input name=operator required size=12></label> "
            "<label>note <input name=note size=24></label> "
            f"<button type=submit>{esc(a.label)}</button></form>"
        )
    return (
        "<section class=actions><h2>Operator actions <span class=muted>each a recorded transition naming you; "
        f"refused if the entity changed since this page</span></h2>{''.join(forms)}</section>"
    )


def entity_location(entity_id: str) -> str:
    return "/entity?" + urlencode({"id": entity_id})


MAX_FORM = 16_384
"""Largest action form body read (bytes)."""


class Refused(Exception):
    """An action refused: ``status`` and what the page says."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_form(body: bytes) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body (one value per name, the first)."""
    from urllib.parse import parse_qs

    if len(body) > MAX_FORM:
        raise Refused(413, "the form is too large")
    try:  # strictly: a percent-escape that is not UTF-8 (a lone surrogate's bytes) is refused, not replaced
        text = body.decode("utf-8")
        fields = parse_qs(text, keep_blank_values=True, max_num_fields=20, encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        raise Refused(400, "the form is not UTF-8 text") from None
    except ValueError:  # more fields than any action form has
        raise Refused(400, "the form has too many fields") from None
    return {k: v[0] for k, v in fields.items()}


def fire_action(form: dict[str, str], *, lifecycles: dict[str, Any], store: Any, expected_csrf: str) -> Snapshot:
    """Check the form and fire its declared override; the snapshot after, or :class:`Refused`."""
    from fsm.engine import Engine
    from fsm.errors import FsmError, StaleVersion, UnknownEntity
    from fsm.inspect.data import BadInput, check_param

    if not hmac.compare_digest(form.get("csrf", "").encode(), expected_csrf.encode()):
        raise Refused(403, "the form's CSRF token is missing or wrong: reload the entity's page")
    try:
        entity_id = check_param("id", form.get("id", ""))
        event = check_param("event", form.get("event", ""))
        operator = check_param("operator", form.get("operator", "").strip(), limit=64)
        note = check_param("note", form.get("note", "").strip(), limit=500)
    except BadInput as err:
        raise Refused(400, str(err)) from None
    if not operator:
        raise Refused(400, "say who you are (operator): the transition's history names you")
    raw_version = form.get("version", "")
    if not (raw_version.isascii() and raw_version.isdigit()) or len(raw_version) > 18:
        raise Refused(400, "the form's version is missing")
    try:
        snap = store.get(entity_id)
    except UnknownEntity:
        raise Refused(404, f"no entity {entity_id!r}") from None
    lifecycle = lifecycles.get(snap.kind)
    if lifecycle is None:
        raise Refused(400, f"the lifecycle {snap.kind!r} was not given to fsm inspect")
    if snap.version != int(raw_version):
        raise Refused(409, f"{entity_id} changed since the page was shown (version {snap.version}): nothing done")
    if event not in {a.event for a in actions_for(lifecycle, snap)}:
        raise Refused(400, f"{event!r} is not an operator override out of {snap.state}")
    engine = Engine(lifecycle, store, owner=f"fsm-inspect:{operator}")
    if event == RETRY:
        return retry_action(engine, snap, operator, note)
    reason = f"operator {operator}" + (f": {note}" if note else "")
    try:
        return engine.fire(snap, event, reason=reason).snapshot
    except StaleVersion:
        raise Refused(409, f"{entity_id} changed while the action ran: nothing done") from None
    except FsmError as err:
        raise Refused(409, f"refused: {err}") from None


def retry_action(engine: Any, snap: Snapshot, operator: str, note: str) -> Snapshot:
    """The retry of a failed entity (:func:`fsm.inspect.retry.retry_failed`): the new one."""
    from fsm.errors import EntityExists
    from fsm.inspect.retry import retry_failed, retry_id

    try:
        return retry_failed(engine, snap.id, operator=operator, note=note, version=snap.version)
    except EntityExists:
        raise Refused(409, f"{snap.id} was retried already, as {retry_id(snap.id)}: nothing done") from None
    except FsmError as err:
        raise Refused(409, f"refused: {err}") from None


__all__ = [
    "ACTION_PATH",
    "RETRY",
    "Action",
    "Refused",
    "actions_for",
    "actions_section",
    "csrf_token",
    "entity_location",
    "fire_action",
    "parse_form",
    "retry_action",
    "same_origin",
]
