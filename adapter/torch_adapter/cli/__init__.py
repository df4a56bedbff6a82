"""The ``torch-adapter`` command (:mod:`.main`) and its sub-commands that live here
(``export``, ``memory``); ``check`` and ``coverage`` bring their own ``cli`` modules."""
