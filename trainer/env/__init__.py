"""What the policy is trained on, the RL environment: the tasks (problems with a prompt, a
reference answer and a reward; conf/task/*.yaml names them by `_target_`), the reward functions
(rewards, with trl_rewards calling those written for TRL as ours, reward_worker calling those
that may hang in a child process with a time limit, reward_check calling each once on real rows
before any trial, reward_model scoring with a sequence-classification model as TRL does, and
length_reward, a bonus for length that a policy can game: task=addition_length) and how a prompt is checked and rendered to token ids, chat
templates included (prompts). Plain Python, no torch (reward_model loads it when first called).
May import trainer.base and trainer.model; it needs neither today beyond base, and the order
keeps the model machinery below everything that uses it.
"""
