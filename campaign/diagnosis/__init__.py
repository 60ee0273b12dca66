"""The parts of diagnosis; ``campaign.diagnose`` is its entry (``diagnose``, ``diagnose_file``)."""
