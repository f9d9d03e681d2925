"""The ``gradwire`` subcommands (:mod:`host.cli` puts them together): ``sim``
(:mod:`~host.commands.sim`), ``compress`` / ``decompress`` / ``info``
(:mod:`~host.commands.codec`), ``board`` (:mod:`~host.commands.board`), ``accuracy``
(:mod:`~host.commands.accuracy`); the ``.gwz`` files that ``compress`` writes
(:mod:`~host.commands.container`)."""
