"""The judge: how a sweep decides, in one place, on plain numbers and recorded trials.

- stats: intervals, the race's levels and bounds;
- blocked: the seed-paired fit (configuration + seed) and a pair's moderated interval;
- forecast: a configuration's final objective forecast from its curve (pruner=forecast);
- configs: one configuration as a sweep recorded it (its seeds), built once from a trial;
- compare: the one comparison of two configurations, with its interval;
- race: what one configuration does next in a race of seeds (seed, stop or hold).

A floor of its own above records/, the only package it imports. The trainer (an eval's
standard error), analysis/ (the reader and the report) and sweeper/ (which reads a live study
for the race) use it.
"""
