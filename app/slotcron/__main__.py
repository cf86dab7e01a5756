from slotcron.cli.main import main

raise SystemExit(main())
