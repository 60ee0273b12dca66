"""``campaign tune``: search a knob space through the real loop and keep a winner only when it is proven.

``space`` (the ``search:`` block and the space it spans), ``strategies`` (tiered, bayes, grid), ``search`` (the
loop: propose, evaluate, learn constraints, stop), ``trials`` (one trial as a run through ``Campaign``), ``finale``
(the interleaved relaunches and the significance test), ``figure`` (the plot), ``tuner`` (the command's core).
"""
