"""Floor 1: the pure policy core.

No Redis, no asyncio, no clock of its own: every function that needs the time is
given it. The Redis store (``fairlane.store``) carries these decisions out in Lua,
and property tests drive both with the same operations to prove they agree.
"""
