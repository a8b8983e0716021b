"""What a run measured: the recorder's rows, per-request frames, the summary and its intervals, the run folder's files."""
