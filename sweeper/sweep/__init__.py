"""Stage 3, the sweep: the take -> launch -> tell loop, the job each launch runs, and what
decides a configuration's seeds (outcome, racing) and the search's end (terminator)."""
