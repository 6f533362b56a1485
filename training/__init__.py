"""Training: tag protocols, generation backends, the rollout engine, rewards, E-step selection, SFT and RL launchers."""
