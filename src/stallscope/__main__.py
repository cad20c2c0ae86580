from stallscope.cli.entry import main

raise SystemExit(main())
