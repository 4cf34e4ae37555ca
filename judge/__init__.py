"""The judge: how a sweep decides, in one place, on plain numbers and recorded trials.

- stats: intervals, the race's levels and bounds, the seed-paired fit;
- forecast: a configuration's final objective forecast from its curve (pruner=forecast);
- configs: one configuration as a sweep recorded it (its seeds), built once from a trial;
- compare: the one comparison of two configurations, with its interval.

A floor of its own, above the trainer and below analysis/ (the reader and the report) and
sweeper/ (the race is a policy that calls it): it imports records/ only.
"""
