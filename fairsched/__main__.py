from fairsched.cli import main

main()
