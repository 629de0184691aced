"""Kubernetes activities: taints, registration and initialization of replacements, termination steps.

Every activity is idempotent (a retry after a crash finds the work done and returns), raises
`ApplicationError`s classified by `activities.errors`, and long waits heartbeat their progress so a
dead worker is noticed within the heartbeat timeout and the wait resumes elsewhere.

The activities live with their responsibility and are composed here into the one class the
worker registers and the workflows call (`KubernetesActivities.begin_termination`...):
activities/taints.py (a command's taint and its rollback), activities/replacement_template.py
(`resolve_replacement`), activities/node_registration.py (a replacement's registration and
initialization), activities/termination_steps.py (a node's termination); what they share is in
activities/kubernetes_base.py, the pure helpers on Node JSON in activities/node_json.py.
"""

from __future__ import annotations

from activities.node_registration import NodeRegistration
from activities.replacement_template import ReplacementTemplates
from activities.taints import TaintActivities
from activities.termination_steps import TerminationSteps


class KubernetesActivities(TaintActivities, ReplacementTemplates, NodeRegistration, TerminationSteps):
    """Activities that act on the Kubernetes API. `poll_interval` paces the waits (seconds)."""
