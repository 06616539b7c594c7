from .cli import process_main

raise SystemExit(process_main())
