"""Service plumbing shared by the dock and the engines (no wire formats, no models).

Import rule: ``svc`` imports nothing of ours; ``ttsdock`` and ``engines`` may
import it (like ``protocol``), so that logging, sd_notify, socket options,
the cmd-port server and the event-loop choice exist once.
"""
