"""``python -m campaign.cli``: the same entry as the ``campaign`` command."""

from campaign.cli import main

main()
