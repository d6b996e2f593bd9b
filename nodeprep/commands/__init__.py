"""Click commands, one module per concern. Each module exports COMMANDS (a list of click commands).
Commands parse options, call one library function and render its result; no logic here."""
