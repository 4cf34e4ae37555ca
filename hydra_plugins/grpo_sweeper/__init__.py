"""Hydra plugins of this project: the GRPO Optuna sweeper and the `tuned/` search path.

Hydra discovers plugins by importing every module under the `hydra_plugins` namespace
package, so these modules stay light: the sweep itself lives in the `sweeper` package and is
imported only when a sweep starts.
"""
