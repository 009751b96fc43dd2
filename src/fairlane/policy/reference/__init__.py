"""The reference model: the whole scheduler as plain Python, the oracle that the store's
scripts (``tests/store``) and the simulator's fast paths are held equal to.

It is not on any production path: workers and the app run the Lua library; this model
exists so that every rule has a second, readable statement to be checked against.
"""
