from course.tools.cli import main

raise SystemExit(main())
