"""A task family's workflows half: how a checkpoint of it is evaluated (:mod:`.registry`: one line per family
whose evaluation is its own, else the token default, :mod:`.tokens`) and the options a family adds to
`stability`, `dynamics` and `accuracy` (:mod:`.options`, torch-free). Importing the package loads nothing."""
