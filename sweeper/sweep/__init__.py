"""Stage 3, the sweep: the take -> launch -> tell loop, the job each launch runs, and what
decides a configuration's seeds (tell, racing), a forecast's prune (forecaster) and the
search's end (terminator)."""
