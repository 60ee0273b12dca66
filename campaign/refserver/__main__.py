"""``python -m campaign.refserver``: run the reference server (see campaign/refserver/server.py)."""

from campaign.refserver.server import run

if __name__ == "__main__":
    run()
