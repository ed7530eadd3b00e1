from difftest.cli import console_main

console_main()
