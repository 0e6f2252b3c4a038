"""Progress bars of resumable commands."""
from __future__ import annotations

import sys

__all__ = ["ResumedBar"]


class ResumedBar:
    """A tqdm bar made at the first progress call, ``initial`` = the prompts a resumed
    run already has (so its rate and ETA count this run's work only)."""

    def __init__(self, desc: str, quiet: bool):
        self.desc, self.quiet, self.bar = desc, quiet, None

    def progress(self, done: int, total: int) -> None:
        from tqdm.auto import tqdm
        if self.bar is None:
            self.bar = tqdm(total=total, initial=done, desc=self.desc, unit="prompt", disable=self.quiet,
                            file=sys.stderr)
        else:
            self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
