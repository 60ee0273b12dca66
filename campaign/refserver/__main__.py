"""``python -m campaign.refserver``: run the reference server (see campaign/refserver/process.py)."""

from campaign.refserver.process import run

if __name__ == "__main__":
    run()
