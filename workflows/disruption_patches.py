"""The `workflow.patched` ids of DisruptionWorkflow, in the order they came (docs/workflow-changes.md
says what each changed; tests/unit/workflows/test_replay*.py replay the histories recorded on either
side of each): keep each until no workflow started before it runs. One list for the workflow's
modules (disruption.py and the parts it inherits), each of which asks the ones on its own paths."""

from __future__ import annotations

PATCH_TERMINATION_PER_INCARNATION = "termination-id-per-node-incarnation"
PATCH_NODECLAIM_REPLACEMENTS = "karpenter-coexistence-nodeclaims"
PATCH_APPROVAL_GATE = "disruption-approval-gate"
# Short calls as local activities, one upsert per wait, children started at once; implies the three
# patches above, which a run on this path never asks (each would cost a marker and an upsert).
PATCH_LEAN_HISTORY = "disruption-lean-history"
# On the lean path beside Karpenter: one wait for each NodeClaim to be Initialized, not three waits
# (Launched, Registered, Initialized): 47 events to 36. Asked only on that path.
PATCH_NODECLAIM_ONE_WAIT = "disruption-nodeclaim-one-wait"
# With a termination deadline, candidates whose terminations fail while a replacement is still on
# its way: that replacement is discarded as on a cancellation (before: its wait was cancelled and
# its instance left running). Asked only on that path, which a run of the older code ended without.
PATCH_DISCARD_ON_TERMINATION_FAILURE = "forceful-deadline-discard-on-failure"
# Issue 30 (the fault matrix), each asked only on the path it changes:
# a cancel no step turned into a phase closes the run in phase Canceled (an upsert before the close);
PATCH_CANCELED_PHASE = "disruption-canceled-phase"
# a rollback whose listing of the command's instances fails still terminates the ones it knows.
PATCH_DISCARD_KNOWN_INSTANCES = "disruption-discard-known-instances"
# Issue 30: a forceful command whose replacement failed after its launch (the instance ended, its node
# vanished) discards it and launches again with another offering. Asked only at that failure.
PATCH_FORCEFUL_RELAUNCH = "disruption-forceful-relaunch"
# Issue 30: in a forceful command with a termination deadline (a spot interruption), a candidate's
# termination that fails no longer cancels the replacements launched beside the drain (the drained
# pods still need them). Asked only when a termination failed while a replacement was in flight.
PATCH_REPLACEMENTS_OUTLIVE = "forceful-replacements-outlive-failed-terminations"
# Issue 30: with a termination deadline the candidates drain while their replacements come up; a
# replacement that initialized may go again before the drained pods land on it (a spot reclaim of
# the new node). Once the terminations are done each one is looked at again, and one gone is
# launched again. Asked only on that path, after a replacement initialized.
PATCH_RECHECK_AFTER_DRAIN = "forceful-replacements-rechecked-after-the-drain"
# A command that waits for approval is judged again now and then while it waits, and when the wait
# ends, before any node is taken (activity check_waiting_command, planner/waiting_validation.py).
PATCH_RECHECK_WAITING = "disruption-recheck-waiting-command"  # how often: Approval.recheck_every
# Issue 35: the operator's webhook is told when a command starts waiting for approval, and when a
# command fails (workflows/notify.py, a child left to run on its own). Each asked only on its path.
PATCH_NOTIFY_APPROVAL = "disruption-notify-approval-pending"
PATCH_NOTIFY_FAILURE = "disruption-notify-failure"
