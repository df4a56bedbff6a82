"""Running unchanged programs adapted: ``torch-adapter run`` (:mod:`.runner`), the child
processes it and torch's launchers start (:mod:`.launchers`, the ``.pth`` start-up hook
:mod:`.autoinstall`), their reports back to the parent and their exit codes.
"""
