"""Multi-turn, tool-calling rollouts: verl's agent loop (actor_rollout_ref.rollout.multi_turn.*, rollout.agent.*).

The model writes a turn, the tool calls in it run, their responses are appended to its context as the chat template
writes tool messages (and a simulated user's reply where an interaction is configured), and it writes the next turn,
to the turn limits. The response holds every turn; its mask is 1 on the model's own tokens only, so the losses, the
KL and the entropy see nothing the model did not write.
"""
