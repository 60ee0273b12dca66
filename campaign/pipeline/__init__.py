"""The pipeline: one run of an experiment on a host, in rooms a newcomer can read one at a time.

- ``run``: ``Campaign.run``, the lock, the record, the variant loop, the ending (``restore_now`` for `campaign
  restore`);
- ``plan``: the plan, made once after the flag check and handed down;
- ``state``: what the steps of one run share (``RunState``), and what a fleet's hosts share (``Share``);
- ``attempt``: one attempt as named stages, timed by one context manager;
- ``restore``: the known-good put back and proven, the hygiene check, ``at_end``;
- ``interrupted``: what a signal or an error leaves recorded;
- the policies: ``deadline``, ``retries``, ``known`` (known failures), ``resumption``, ``rounds`` (relaunch
  rounds), ``isolation``;
- ``events``: what the live display is told.
"""

from campaign.pipeline.events import Event, EventKind, EventSink
from campaign.pipeline.plan import Plan
from campaign.pipeline.run import Campaign, restore_now
from campaign.pipeline.state import RunState, Share

__all__ = ["Campaign", "Event", "EventKind", "EventSink", "Plan", "RunState", "Share", "restore_now"]
