"""The 'natural' training prompts: requests written the way people write them.

Composed, seeded, from hand-written pieces (never from the held-out set,
`held_out_natural.json`, written separately): coding requests (write / fix /
explain / refactor / test in several languages), edits that paste code and ask
for a change (the answer repeats much of the prompt), single- and multi-turn
chat, math word problems with drawn numbers, and tool-use turns in an agent
format. Pasted code is real: functions of the stdlib files in the training
share of `agent_context` (the long-context eval reads the other share).
Version 2 of the pieces (`pieces=2`) adds more of each, snippets of people's
own projects, files and text to edit and non-coding tool harnesses.
Version 4 (`pieces=4`) also draws whole requests written free-form by several
authors apart from the held-out set (`natural_free.json`), so that not every
training request is a composition of the same few hundred pieces; version 5
adds a second such set (`natural_free_2.json`) and draws 60% of the requests
from the two; version 6 a third (`natural_free_3.json`, weighted to chat,
explanations and math, the weakest categories) and 70% from the three.
`long_prompts` adds agent transcripts of 1-8k tokens. `shared_spans` checks
that no held-out prompt shares a long word span with a training prompt.
"""

import ast
import json
import random
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .agent_context import HARNESSES, _read, _tool, stdlib_files, system_prompt, transcript
from .prompts import Prompt

LANGUAGES = (
    "Python JavaScript TypeScript Go Rust Java C C++ C# Ruby PHP Kotlin Swift Bash "
    "Lua Haskell Scala"
).split()

TASKS = [
    "counts how many vowels are in a string",
    "returns the n-th Fibonacci number iteratively",
    "checks if a year is a leap year",
    "converts a Roman numeral to an integer",
    "finds the second largest number in a list",
    "rotates an array by k positions",
    "parses a query string like a=1&b=2 into a map",
    "computes the median of a list of numbers",
    "chunks a list into pieces of size n",
    "validates an IPv4 address",
    "computes the Levenshtein distance between two strings",
    "implements a queue with two stacks",
    "retries a function up to 3 times with exponential backoff",
    "reads a CSV file and sums one column",
    "generates a random password of a given length",
    "implements a simple token bucket rate limiter",
    "merges overlapping intervals",
    "finds all prime numbers below n with a sieve",
    "transposes a matrix",
    "caches the results of a function (memoization)",
    "converts snake_case to camelCase",
    "flattens a nested dictionary into dotted keys",
    "does a breadth-first search on a graph given as an adjacency list",
    "counts word frequencies in a text file and prints the top 10",
    "checks whether two rectangles overlap",
    "implements a min-heap with push and pop",
    "truncates a string to n characters and adds an ellipsis",
    "computes the greatest common divisor of two numbers",
    "formats a duration in seconds as HH:MM:SS",
    "finds the longest common prefix of a list of strings",
    "parses a date string and returns the weekday",
    "implements a trie with insert and search",
    "walks a directory tree and lists files larger than 1 MB",
    "shuffles a list in place (Fisher-Yates)",
    "converts an integer to its binary representation",
    "implements a basic event emitter with on/off/emit",
    "sends a JSON POST request and handles errors",
    "implements a circular buffer",
    "checks if a linked list has a cycle",
    "debounces calls to a function",
]

WRITE = [
    "Write a {lang} function that {task}.",
    "how do i write something in {lang} that {task}?",
    "Can you give me {lang} code that {task}? Keep it simple please.",
    "I need a small {lang} program that {task}. Add comments.",
    "Show me an idiomatic {lang} solution: a function that {task}.",
    "{lang}: write a function that {task}, with a usage example.",
    "Please implement, in {lang}, a helper that {task}. Handle edge cases.",
    "quick question - what's the cleanest way in {lang} to write code that {task}",
]

# (what the request says, a template taking the pasted code)
SNIPPET_ASKS = {
    "code_explain": [
        "What does this code do?\n\n```{lang}\n{code}\n```",
        "Can you explain this function line by line?\n\n```{lang}\n{code}\n```",
        "I found this in our codebase and don't understand it. Explain please:\n\n```{lang}\n{code}\n```",
        "```{lang}\n{code}\n```\nExplain what this is for and how it works.",
    ],
    "code_refactor": [
        "Refactor this to make it more readable:\n\n```{lang}\n{code}\n```",
        "How would you improve this code?\n\n```{lang}\n{code}\n```",
        "Clean up this function, keep the behaviour the same:\n\n```{lang}\n{code}\n```",
        "Simplify this code, and tell me what you changed:\n\n```{lang}\n{code}\n```",
    ],
    "code_test": [
        "Write unit tests for this:\n\n```{lang}\n{code}\n```",
        "Write pytest tests covering the edge cases of this function:\n\n```{lang}\n{code}\n```",
        "Can you add tests for the following code?\n\n```{lang}\n{code}\n```",
    ],
    "copy_edit": [
        "Add type hints to this code and return the full code:\n\n```{lang}\n{code}\n```",
        "Add a docstring and comments to this function, keep the code unchanged:\n\n```{lang}\n{code}\n```",
        "Rename the function to `{new}` and show me the whole thing:\n\n```{lang}\n{code}\n```",
        "Add logging calls to this function and give me back the complete code:\n\n```{lang}\n{code}\n```",
        "Make this function raise a ValueError on invalid input. Full code please.\n\n```{lang}\n{code}\n```",
        "Reformat this code to follow PEP 8 and return it:\n\n```{lang}\n{code}\n```",
        "Here's my code:\n\n```{lang}\n{code}\n```\nChange it to use f-strings wherever it builds strings, and paste the result.",
    ],
    "code_fix": [
        "This function has a bug, can you find and fix it?\n\n```{lang}\n{code}\n```",
        "My code gives the wrong result sometimes. What's wrong?\n\n```{lang}\n{code}\n```",
        "Something is off in this code, the tests fail. Fix it:\n\n```{lang}\n{code}\n```",
        "```{lang}\n{code}\n```\nI think there's an off-by-one or logic error here. Can you check?",
    ],
}

# Small bugs put into real code for the fix requests (pattern, replacement).
MUTATIONS = [
    (r" < ", " <= "),
    (r" > ", " >= "),
    (r" == ", " != "),
    (r" \+ 1\b", ""),
    (r" - 1\b", ""),
    (r"\bTrue\b", "False"),
    (r"\band\b", "or"),
    (r"\bnot ", ""),
]

OTHER_SNIPPETS = [
    ("javascript", "function sum(arr) {\n  let total = 0;\n  for (let i = 0; i <= arr.length; i++) {\n    total += arr[i];\n  }\n  return total;\n}"),
    ("go", "func Contains(xs []string, s string) bool {\n\tfor _, x := range xs {\n\t\tif x == s {\n\t\t\treturn true\n\t\t}\n\t}\n\treturn false\n}"),
    ("rust", "fn word_count(text: &str) -> usize {\n    text.split_whitespace().count()\n}"),
    ("java", "public static int factorial(int n) {\n    if (n == 0) return 1;\n    return n * factorial(n - 1);\n}"),
    ("c", "int max_index(const int *a, int n) {\n    int best = 0;\n    for (int i = 1; i < n; i++)\n        if (a[i] > a[best]) best = i;\n    return best;\n}"),
    ("typescript", "export function unique<T>(xs: T[]): T[] {\n  return xs.filter((x, i) => xs.indexOf(x) === i);\n}"),
    ("bash", "#!/bin/bash\nfor dir in \"$@\"; do\n  count=$(find \"$dir\" -type f | wc -l)\n  echo \"$dir: $count files\"\ndone"),
    ("sql", "SELECT c.name, SUM(o.total) AS spent\nFROM clients c JOIN purchases o ON o.client_id = c.id\nWHERE o.created_at >= '2024-01-01'\nGROUP BY c.name;"),
    ("ruby", "def titleize(s)\n  s.split(' ').map { |w| w.capitalize }.join(' ')\nend"),
    ("kotlin", "fun isPrime(n: Int): Boolean {\n    if (n < 2) return false\n    for (i in 2 until n) if (n % i == 0) return false\n    return true\n}"),
]

CHAT = [
    "what should i cook tonight? i have eggs, spinach and some cheese",
    "Give me some tips for staying focused while working from home.",
    "How do I ask my boss for a raise?",
    "What are some fun things to do on a rainy weekend with kids?",
    "Can you explain how vaccines work in simple terms?",
    "Recommend a few podcasts about history.",
    "I'm nervous about public speaking. Any advice?",
    "How can I save money on groceries?",
    "What's the best way to learn to play guitar as an adult?",
    "Why do cats purr?",
    "How long should I steep green tea?",
    "help me pick a name for my new puppy, she's a small brown terrier",
    "What is the difference between a virus and a bacterium?",
    "How do I get rid of fruit flies in my kitchen?",
    "Suggest a weekly workout plan for a beginner.",
    "What are good questions to ask at the end of an interview?",
    "How does compound interest work?",
    "my plants keep dying, what am I doing wrong?",
    "Can you summarize the plot of Romeo and Juliet?",
    "What's a healthy breakfast that takes 5 minutes?",
    "is it ok to drink coffee before a workout?",
    "What's the best way to memorize vocabulary in a new language?",
    "How do noise-cancelling headphones work?",
    "Plan a cheap date night at home.",
    "How often should I change my car's oil?",
    "what are some good habits for a productive morning",
    "Explain the offside rule in football.",
    "Why do we have leap years?",
    "Give me a packing list for a weekend camping trip.",
    "How can I make my small apartment feel bigger?",
]
CHAT_ABOUT = [
    "{q} I'm {who}.", "{q}", "Quick one: {q}", "{q} Please keep the answer under 100 words.",
]
WHO = ["a student", "retired", "a nurse working night shifts", "new to the city",
       "on a tight budget", "a parent of two toddlers", "a software developer"]
WRITING = ["an email", "a short text message", "a LinkedIn post", "a thank-you note",
           "a toast", "a product review", "a short poem", "a cover letter opening",
           "an apology message", "a tweet"]
WRITING_ABOUT = [
    "to my landlord about a leaking tap", "thanking a coworker for covering my shift",
    "announcing that I got a new job", "for my sister's wedding", "about a coffee grinder I bought",
    "about autumn in the city", "to a client about a delayed delivery",
    "inviting friends to a board game night", "for a teacher at the end of the school year",
    "about finishing my first marathon",
]
TONES = ["", " Keep it short.", " Make it funny.", " Make it formal.", " Friendly tone please."]

FIRST_TURNS = [
    ("What's a good first programming language?", "Python is a popular first language: its syntax is readable and it is used for web development, data analysis and automation."),
    ("I want to eat healthier.", "A good start is to add vegetables to every meal, drink more water, and cut down on sugary drinks and snacks."),
    ("Can you help me write a story?", "Of course! What genre would you like, and do you have a main character in mind?"),
    ("How do I make my resume stand out?", "Lead with concrete achievements, use numbers where you can, and tailor the resume to each job posting."),
    ("What's the capital of Australia?", "The capital of Australia is Canberra."),
    ("I'm learning SQL.", "Great! Start with SELECT, WHERE, JOIN and GROUP BY; most everyday queries use only these."),
    ("Tell me about the Moon.", "The Moon is Earth's only natural satellite, about a quarter of Earth's diameter, and it causes the ocean tides."),
    ("I need a gift idea for my dad.", "What does he enjoy? Hobbies like cooking, gardening or sports can point to a thoughtful gift."),
]
FOLLOW_UPS = [
    "Can you give me more detail?", "ok, what next?", "Can you make that shorter?",
    "Why is that?", "Give me an example.", "Thanks! Any other ideas?",
    "He likes fishing and old movies.", "A mystery story with a detective cat.",
    "What would you recommend for a complete beginner?", "can you put that in a list",
    "Could you explain it differently?", "And what are the downsides?",
    "how long would that take?", "Great, can you write that as an email?",
]

NAMES = "Ana Ben Chloe Dev Elif Farid Grace Hiro Ines Jonas Kofi Lena Marco Nadia Omar Priya".split()
ITEMS = "apples pencils stickers cookies marbles books stamps cards shells balloons".split()
MATH = [
    "{n1} has {a} {item}. {n2} gives {n1} {b} more, then {n1} uses {c}. How many {item} does {n1} have now?",
    "A store sells {item} at ${p} each. {n1} buys {a} and pays with a ${bill} bill. How much change?",
    "{n1} reads {a} pages a day. The book has {big} pages. How many days to finish it?",
    "A car uses {a} liters of fuel per 100 km. How much fuel for a trip of {big} km?",
    "{n1} is {a} years older than {n2}. In {b} years their ages will add up to {big}. How old is {n2} now?",
    "A pool is {a} m long and {b} m wide. How many square meters is its surface?",
    "If {a} workers build a wall in {b} days, how long would {c} workers take at the same rate?",
    "The price of a bike went from ${big} to ${p2}. By what percent did it change?",
    "{n1} walks at {a} km/h for {b} hours and then cycles at {c} km/h for 2 hours. How far in total?",
    "A class has {big} students and {a}% of them play a sport. How many don't?",
    "Solve for x: {a}x + {b} = {big}. Show the steps.",
    "{n1} splits ${big} among {a} friends equally. How much does each get, to the cent?",
]
MATH_STYLE = ["", " Explain step by step.", " Show your work.", " Just give the answer with a short explanation."]

TOOL_ASKS = [
    "run the tests and tell me what fails",
    "find where the logging is configured",
    "what does the main entry point of this project do?",
    "Create a .gitignore for a Python project.",
    "Check which version of Python is installed.",
    "list the files in the src directory",
    "Search the code for uses of `subprocess` and tell me if any are unsafe.",
    "Fix the failing import in the package's __init__.py.",
    "How big is the repository on disk?",
    "Read the README and summarize the setup steps.",
]
# Requests about a file of the training share (the path and a name drawn from it).
TOOL_FILE_ASKS = [
    "Open {path} and explain what `{name}` does.",
    "Where is `{name}` defined? I think it's somewhere in {path}.",
    "Add a docstring to `{name}` in {path}.",
    "Run the tests for {path}.",
    "can you check {path} for unused imports",
    "Write a test for `{name}` ({path}) and run it.",
    "Rename `{name}` in {path} to something clearer and update the callers.",
    "Is `{name}` in {path} thread-safe?",
]
TOOL_RESULTS = [
    "FAILED tests/test_io.py::test_roundtrip - AssertionError: b'' != b'data'\n1 failed, 41 passed in 2.31s",
    "Python 3.12.3",
    "src/\n  __init__.py\n  cli.py\n  core.py\n  utils.py",
    "README.md:12: pip install -e .\nREADME.md:13: make test",
    "  4.2M\t.",
]


# --- Pieces added for `pieces=2` (twenty-second session): the generator's own
# unseen prompts score as high as its seen ones while hand-written ones stay
# far lower (bench/results/cpu-probe-generalization-stage5.jsonl), so version 2
# widens what the requests are about and how they are put. Version 1 (above)
# stays what stages 3-5 of the default drafter were trained on.
TASKS_2 = [
    "removes duplicate lines from a text file but keeps the order",
    "checks whether a string is a valid email address (roughly)",
    "converts a temperature between Celsius and Fahrenheit",
    "groups a list of words by their first letter",
    "downloads a web page and counts the links on it",
    "reverses the words in a sentence",
    "turns a list of pairs into a dictionary, summing values of repeated keys",
    "finds the most common element in a list",
    "pads a number with leading zeros to a given width",
    "paginates a list: page number and page size in, items out",
    "computes a running average of a stream of numbers",
    "checks if a string has balanced brackets",
    "splits a full name into first and last name",
    "calculates the number of business days between two dates",
    "renames all .jpeg files in a folder to .jpg",
    "reads environment variables with defaults into a config object",
    "returns the n largest files in a directory",
    "converts a hex color like #ff8800 to RGB",
    "zips two lists into a list of tuples, padding the shorter one",
    "counts lines of code in a project, skipping blank lines and comments",
    "validates that a password has a digit, an uppercase letter and 8+ characters",
    "computes the distance between two latitude/longitude points",
    "parses a simple INI file into nested maps",
    "watches a file and prints new lines as they are appended",
    "generates all permutations of a string",
    "implements binary search on a sorted array",
    "merges two sorted lists into one sorted list",
    "sorts a list of records by two keys",
    "throttles a function so it runs at most once per second",
    "compresses a string like aaabcc into a3b1c2",
    "checks whether two strings are anagrams",
    "converts a number of minutes into hours and minutes",
    "builds a URL with query parameters safely escaped",
    "finds the first non-repeating character in a string",
    "computes the factorial of n with big integers",
    "reads a JSON file, updates one field and writes it back",
    "draws a text progress bar for a loop",
    "implements an LRU cache with a fixed capacity",
    "checks whether a number is a palindrome without converting it to a string",
    "splits a large file into chunks of 10 MB",
    "schedules a task to run every five minutes",
    "counts the occurrences of each character in a string",
    "finds pairs in a list that add up to a target",
    "validates a credit card number with the Luhn check",
    "strips HTML tags from a string",
    "computes the day of the year for a date",
    "normalizes whitespace in a string",
    "retries an HTTP request when the server returns 503",
    "finds the deepest nesting level of a JSON document",
    "converts a CSV file to JSON",
    "generates a UUID and stores it with a timestamp",
    "counts the number of islands in a grid of 0s and 1s",
    "calculates compound interest over n years",
    "tails the last 20 lines of a log file",
    "maps HTTP status codes to short descriptions",
    "checks if a binary tree is balanced",
    "rounds a price to the nearest 5 cents",
    "extracts all hashtags from a tweet",
    "computes the checksum (SHA-256) of a file in chunks",
    "parses command line flags --name and --count",
]
WRITE_2 = [
    "hey can u write a {lang} func that {task}",
    "For a school project I need {lang} code that {task}. Please explain it too.",
    "At work we need a {lang} utility that {task}. Performance matters a bit.",
    "Write {lang} that {task}. No external libraries.",
    "I'm a beginner in {lang}. How would I make something that {task}?",
    "Give me two ways in {lang} to write a function that {task}, and say which is better.",
    "{lang} please - a function that {task}. Include a couple of tests.",
    "Could you write me a {lang} script that {task}? I'll run it from the terminal.",
    "what's a short {lang} snippet that {task}",
    "Implement this in {lang}: a function that {task}. Then tell me its time complexity.",
]
# Conceptual questions a code_explain request may be instead of pasted code.
CONCEPTS = [
    "What is the difference between a process and a thread?",
    "Explain git rebase vs git merge. When should I use which?",
    "What does `async`/`await` actually do in JavaScript?",
    "Why is my Python list comprehension faster than a for loop?",
    "What's a closure? Give me an example.",
    "How does a hash map work under the hood?",
    "what is dependency injection and why do people use it",
    "Explain Big O notation like I'm new to programming.",
    "What is the GIL in Python?",
    "What does `volatile` mean in Java?",
    "Can you explain what a REST API is?",
    "What is the difference between == and === in JavaScript?",
    "How do Docker containers differ from virtual machines?",
    "What is a race condition?",
    "Why do people say global variables are bad?",
    "What happens when I type a URL into the browser and press enter?",
    "Explain recursion with a simple example.",
    "What's the difference between an abstract class and an interface?",
    "How does garbage collection work in Go?",
    "What does `*args, **kwargs` mean in a Python function signature?",
    "What is a SQL index and when does it help?",
    "Explain the difference between a stack and a queue.",
    "What does the `static` keyword do in C?",
    "How do Rust's ownership rules prevent memory bugs?",
    "what's the point of unit tests if the code already works",
    "What is a mutex and how is it different from a semaphore?",
    "How does HTTPS keep my data safe?",
    "What is memoization?",
    "Explain what `git stash` does.",
    "What's the difference between `let`, `const` and `var`?",
]
# Short inline code asked about (the held-out set's one-liners are its own).
INLINE = [
    ("Python", "`words = sorted(set(text.split()), key=len)`"),
    ("Python", "`total = sum(x for x in nums if x > 0)`"),
    ("JavaScript", "`const ids = users.map(u => u.id).filter(Boolean);`"),
    ("Python", "`first, *rest = line.split(',')`"),
    ("Bash", "`find . -name '*.log' -mtime +7 -delete`"),
    ("SQL", "`SELECT dept, COUNT(*) FROM staff GROUP BY dept HAVING COUNT(*) > 5;`"),
    ("Python", "`lookup = dict(zip(keys, values))`"),
    ("JavaScript", "`const copy = { ...settings, theme: 'dark' };`"),
    ("Go", "`defer f.Close()`"),
    ("Rust", "`let n: u32 = input.trim().parse().unwrap_or(0);`"),
    ("Python", "`with open(path) as f: rows = [l.rstrip('\\n') for l in f]`"),
    ("Bash", "`grep -rn TODO src/ | wc -l`"),
]
INLINE_ASKS = [
    "What does this {lang} line do? {code}",
    "Can someone explain {code} ({lang})?",
    "In {lang}, what is {code} doing exactly?",
]
CHAT_2 = [
    "How do I stop procrastinating on a big project?",
    "what's a good way to start running if I've never done it",
    "Should I pay off my student loan early or invest the money?",
    "How can I be a better listener?",
    "What are some easy houseplants for a dark room?",
    "How do I clean a cast iron pan?",
    "Can you recommend a few classic novels for someone who doesn't read much?",
    "why do onions make you cry",
    "How should I prepare for a job interview at a startup?",
    "What actually happens when you put metal in a microwave?",
    "Tips for traveling on a budget in Europe?",
    "How do I deal with a noisy neighbor politely?",
    "What are some ways to reduce stress before exams?",
    "How do airplanes stay in the air?",
    "What should I look for when buying a used car?",
    "how do i make friends in a new city",
    "Explain inflation in simple words.",
    "What are some good board games for four adults?",
    "How much water should I drink a day?",
    "What's a good routine for learning to draw?",
    "Can you give me ideas for a 10-year-old's birthday party?",
    "How do I start a vegetable garden on a balcony?",
    "Why do we dream?",
    "What's the best way to keep a conversation going on a first date?",
    "How do solar panels work?",
    "How can I improve my handwriting?",
    "What are the pros and cons of electric cars?",
    "How do I politely say no to extra work?",
    "Suggest some healthy snacks for work.",
    "What's a simple way to start meditating?",
    "How do I remove a coffee stain from a white shirt?",
    "What is the stock market, basically?",
    "give me a few ideas for a weekend trip near the mountains",
    "How do I teach my dog to stop pulling on the leash?",
    "What's the history of the Olympic Games in a few sentences?",
    "How does a credit score work?",
    "What are some good ways to practice speaking a new language alone?",
    "How do I fix a squeaky door?",
    "What is photosynthesis?",
    "How can I get better at saving money each month?",
]
WHO_2 = ["a teenager", "working two jobs", "just moved abroad", "a small business owner",
         "recovering from a knee injury", "a first-time manager", "living with roommates"]
WRITING_2 = ["a birthday message", "a short speech", "a reminder email", "a haiku",
             "a resignation letter", "a bio for my website", "a note for my neighbor"]
WRITING_ABOUT_2 = [
    "for my best friend who is turning 30", "asking my team to submit timesheets by Friday",
    "about the first snow of the year", "about leaving my job after five years",
    "for a freelance graphic designer", "asking them to keep the hallway clear",
    "congratulating a colleague on a promotion", "about my grandmother's garden",
]
MATH_2 = [
    "A recipe needs {a} eggs for {b} people. How many eggs for {big} people?",
    "{n1} saves ${a} every week. How many weeks until {n1} has ${big}?",
    "A movie starts at {a}:15 pm and runs for {big} minutes. When does it end?",
    "A rectangle has a perimeter of {big} cm and one side of {a} cm. What is its area?",
    "What is {a}/{b} + {c}/{a} as a fraction in lowest terms?",
    "{n1} ran {a} km on Monday, {b} km on Tuesday and {c} km on Wednesday. What was the average per day?",
    "A shirt costs ${big} and is on sale for {c}0% off. What is the sale price?",
    "How many seconds are there in {a} hours and {b} minutes?",
    "A tank holds {big} liters and fills at {a} liters per minute. How long to fill it halfway?",
    "{n1} is twice as old as {n2}. Together they are {big} years old. How old is each?",
]



# Version 3 (twenty-fourth session): at stage 6 the generator's unseen math
# prompts scored tau 5.7 against 2.3 for hand-written ones and chat 2.2 against
# 1.5 (bench/results/cpu-probe-generalization-s24.jsonl): 22 templates teach the
# answers' shapes, not arithmetic written other ways. More kinds of problems
# (rates, geometry, probability, units, time, money, sequences, algebra) and
# more everyday questions.
MATH_3 = [
    "{n1} drives {big} km at an average of {a}0 km/h. How long does the drive take in hours and minutes?",
    "A phone plan costs ${a} a month plus ${c} for every GB over the limit. {n1} went {b} GB over. What is the bill?",
    "What is {p}% of {big}?",
    "A jar has {a} red and {b} blue {item}. If {n1} picks one without looking, what is the chance it is red?",
    "Two dice are rolled. What is the probability the sum is {c}?",
    "Convert {big} minutes to hours and minutes.",
    "A triangle has sides {a}, {b} and {c} cm. Can such a triangle exist? Why or why not?",
    "The area of a square is {big} square meters. How long is one side, roughly?",
    "A circle has a radius of {a} cm. What is its circumference and its area?",
    "{n1} earns ${big} a week and spends {p}% on rent. How much is left for everything else?",
    "What is the next number in the sequence {a}, {a2}, {a3}, {a4}, ...?",
    "If 3 notebooks cost ${a}, how much do {b} notebooks cost?",
    "A train leaves at {a}:40 and arrives at {b}:05 the next hour. How long is the trip? (Assume the times are on the same day.)",
    "Solve the system: x + y = {big} and x - y = {a}.",
    "Expand (x + {a})(x - {b}).",
    "Factor x^2 + {s}x + {m}.",
    "What is the average of {a}, {b}, {c}, {big} and {p}?",
    "A box is {a} cm long, {b} cm wide and {c} cm tall. What is its volume in liters?",
    "{n1} invests ${big} at {c}% simple interest per year. How much interest after {a} years?",
    "A bakery makes {big} rolls and packs them in bags of {a}. How many full bags, and how many rolls are left over?",
    "How many ways can {c} people stand in a line?",
    "A map uses a scale of 1:{a}0000. Two towns are {b} cm apart on the map. How far apart are they really, in km?",
    "{n1} got {a} out of {b}0 questions wrong on a test. What percent did {n1} get right?",
    "It is {p} degrees Celsius outside. What is that in Fahrenheit?",
    "A ladder {b} m long leans against a wall with its foot {c} m from the wall. How high up the wall does it reach?",
    "Is {big} a prime number? Explain how you checked.",
    "What is the least common multiple of {a} and {b}?",
    "A shop raises a price by {p}% and later lowers the new price by {p}%. Is it back to the original price?",
    "{n1} types {a}0 words a minute. How long will a {big}0-word essay take to type?",
    "A garden is {a} m by {b} m with a path {c} m wide all around the outside. What is the area of the path?",
    "Round {big}.{p2} to the nearest ten and to the nearest whole number.",
    "A video is {a} minutes {b} seconds long and plays at 1.5x speed. How long does it take to watch?",
    "The ratio of cats to dogs at a shelter is {a}:{b}. There are {big} animals in all. How many are cats?",
    "If f(x) = {a}x^2 - {b}, what is f({c})?",
    "{n1} and {n2} paint a fence together. {n1} alone takes {a} hours and {n2} alone takes {b} hours. How long together?",
    "How many minutes are there in a week?",
]
CHAT_3 = [
    "What's the best way to learn to cook if I can only make pasta?",
    "Why do cats knock things off tables?",
    "How do I ask my boss for a raise without sounding pushy?",
    "Is it bad to charge my phone overnight?",
    "What are some fun things to do on a rainy weekend with kids?",
    "How do I get better at remembering people's names?",
    "what is the difference between a virus and a bacteria",
    "How do I keep basil alive on a windowsill?",
    "Why is the ocean salty but rivers aren't?",
    "What should I pack for a three-day hiking trip?",
    "How can I tell if an email is a phishing scam?",
    "What's a simple weekly workout plan for a beginner with no equipment?",
    "Why do we get goosebumps?",
    "How do I write a good cover letter when I have no experience?",
    "what are some good podcasts for learning history",
    "How do noise-cancelling headphones work?",
    "Can you help me plan a birthday dinner for six people on a small budget?",
    "Why does bread go stale?",
    "How do I politely say no to extra work?",
    "What are the pros and cons of working from home?",
    "How do vaccines train the immune system?",
    "What's a good routine to fall asleep faster?",
    "How do I start learning to draw as an adult?",
    "why do my headphones always get tangled",
    "What's the difference between a Roth IRA and a traditional IRA?",
    "How do I get rid of fruit flies in the kitchen?",
    "Can you explain how a credit score works?",
    "What are some good icebreaker questions for a team meeting?",
    "How do solar panels turn sunlight into electricity?",
    "Is coffee actually bad for you?",
    "How do I make my small apartment feel bigger?",
    "What should I know before adopting a dog?",
    "Why do leaves change color in autumn?",
    "How do I stay motivated to learn a language on my own?",
    "What's a polite way to remind a friend they owe me money?",
    "How does compound interest work? Give me an example.",
    "What are some healthy snacks I can take to work?",
    "Why do we dream?",
    "How do I fix a squeaky door?",
    "What is a good first programming language for a twelve-year-old?",
]

# Version 2's snippet requests: code people paste from their own projects
# (not the standard library's), in several languages; asks put their own way;
# and test requests that describe the function instead of pasting it. At stage
# 5 the generator's unseen snippet requests scored τ 3.0-5.9 a category against
# 2.4-2.8 for hand-written ones (bench/results/cpu-probe-generalization-s23.jsonl).
SNIPPETS_2 = [
    ("python", "def load_users(path):\n    users = []\n    with open(path) as f:\n        for line in f:\n            name, age, city = line.strip().split(';')\n            users.append({'name': name, 'age': int(age), 'city': city})\n    return users"),
    ("python", "class Cart:\n    def __init__(self):\n        self.items = {}\n\n    def add(self, sku, qty=1):\n        self.items[sku] = self.items.get(sku, 0) + qty\n\n    def remove(self, sku):\n        if sku in self.items:\n            del self.items[sku]\n\n    def total(self, prices):\n        return sum(prices[s] * q for s, q in self.items.items())"),
    ("python", "import requests\n\ndef get_weather(city):\n    r = requests.get('https://api.example.com/weather', params={'q': city})\n    data = r.json()\n    return data['main']['temp'] - 273.15"),
    ("python", "def chunk_text(text, size):\n    words = text.split()\n    chunks = []\n    current = []\n    for w in words:\n        current.append(w)\n        if len(current) == size:\n            chunks.append(' '.join(current))\n            current = []\n    if current:\n        chunks.append(' '.join(current))\n    return chunks"),
    ("python", "import pandas as pd\n\ndf = pd.read_csv('sales.csv')\ndf['month'] = pd.to_datetime(df['date']).dt.month\nmonthly = df.groupby('month')['amount'].sum()\nprint(monthly.sort_values(ascending=False).head(3))"),
    ("python", "from flask import Flask, request, jsonify\n\napp = Flask(__name__)\ntodos = []\n\n@app.route('/todos', methods=['POST'])\ndef add_todo():\n    todo = request.get_json()\n    todos.append(todo)\n    return jsonify(todo), 201"),
    ("python", "def parse_duration(s):\n    units = {'h': 3600, 'm': 60, 's': 1}\n    total = 0\n    number = ''\n    for ch in s:\n        if ch.isdigit():\n            number += ch\n        else:\n            total += int(number) * units[ch]\n            number = ''\n    return total"),
    ("python", "def retry(fn, attempts=3):\n    for i in range(attempts):\n        try:\n            return fn()\n        except Exception as e:\n            print('attempt', i + 1, 'failed:', e)\n    raise RuntimeError('all attempts failed')"),
    ("python", "def top_scores(scores, n):\n    ranked = sorted(scores.items(), key=lambda kv: kv[1], reverse=True)\n    return [name for name, _ in ranked[:n]]"),
    ("python", "import os\n\ndef folder_size(root):\n    size = 0\n    for dirpath, _, files in os.walk(root):\n        for name in files:\n            size += os.path.getsize(os.path.join(dirpath, name))\n    return size / 1024 / 1024"),
    ("python", "def is_palindrome(s):\n    cleaned = [c.lower() for c in s if c.isalnum()]\n    return cleaned == cleaned[::-1]"),
    ("python", "def flatten(nested):\n    out = []\n    for x in nested:\n        if isinstance(x, list):\n            out.extend(flatten(x))\n        else:\n            out.append(x)\n    return out"),
    ("python", "def apply_discount(order):\n    if order['customer'] == 'vip':\n        if order['total'] > 100:\n            return order['total'] * 0.8\n        return order['total'] * 0.9\n    if order['total'] > 200:\n        return order['total'] * 0.95\n    return order['total']"),
    ("python", "import sqlite3\n\ndef find_book(title):\n    conn = sqlite3.connect('library.db')\n    cur = conn.cursor()\n    cur.execute(\"SELECT * FROM books WHERE title = '\" + title + \"'\")\n    row = cur.fetchone()\n    conn.close()\n    return row"),
    ("javascript", "async function loadPosts() {\n  const res = await fetch('/api/posts');\n  const posts = await res.json();\n  const list = document.getElementById('posts');\n  posts.forEach(p => {\n    const li = document.createElement('li');\n    li.textContent = p.title;\n    list.appendChild(li);\n  });\n}"),
    ("javascript", "function debounce(fn, wait) {\n  let timer;\n  return function (...args) {\n    clearTimeout(timer);\n    timer = setTimeout(() => fn.apply(this, args), wait);\n  };\n}"),
    ("javascript", "const express = require('express');\nconst app = express();\napp.use(express.json());\n\napp.get('/users/:id', async (req, res) => {\n  const user = await db.users.findById(req.params.id);\n  res.json(user);\n});\n\napp.listen(3000);"),
    ("typescript", "interface Task {\n  id: number;\n  title: string;\n  done: boolean;\n}\n\nfunction pending(tasks: Task[]): string[] {\n  return tasks.filter(t => !t.done).map(t => t.title);\n}"),
    ("typescript", "function groupBy<T>(items: T[], key: (x: T) => string): Record<string, T[]> {\n  const out: Record<string, T[]> = {};\n  for (const item of items) {\n    const k = key(item);\n    if (!out[k]) out[k] = [];\n    out[k].push(item);\n  }\n  return out;\n}"),
    ("go", "func ReadLines(path string) ([]string, error) {\n\tf, err := os.Open(path)\n\tif err != nil {\n\t\treturn nil, err\n\t}\n\tdefer f.Close()\n\tvar lines []string\n\tscanner := bufio.NewScanner(f)\n\tfor scanner.Scan() {\n\t\tlines = append(lines, scanner.Text())\n\t}\n\treturn lines, scanner.Err()\n}"),
    ("go", "func handler(w http.ResponseWriter, r *http.Request) {\n\tname := r.URL.Query().Get(\"name\")\n\tif name == \"\" {\n\t\tname = \"world\"\n\t}\n\tfmt.Fprintf(w, \"hello, %s\", name)\n}"),
    ("rust", "fn average(values: &[f64]) -> Option<f64> {\n    if values.is_empty() {\n        return None;\n    }\n    Some(values.iter().sum::<f64>() / values.len() as f64)\n}"),
    ("rust", "struct Inventory {\n    items: HashMap<String, u32>,\n}\n\nimpl Inventory {\n    fn add(&mut self, name: &str, n: u32) {\n        *self.items.entry(name.to_string()).or_insert(0) += n;\n    }\n}"),
    ("java", "public List<String> longWords(List<String> words, int min) {\n    List<String> out = new ArrayList<>();\n    for (String w : words) {\n        if (w.length() > min) {\n            out.add(w.toLowerCase());\n        }\n    }\n    return out;\n}"),
    ("java", "public class Temperature {\n    private double celsius;\n    public Temperature(double celsius) { this.celsius = celsius; }\n    public double toFahrenheit() { return celsius * 9 / 5 + 32; }\n}"),
    ("csharp", "public static int CountVowels(string s)\n{\n    int count = 0;\n    foreach (char c in s.ToLower())\n    {\n        if (\"aeiou\".Contains(c)) count++;\n    }\n    return count;\n}"),
    ("cpp", "#include <vector>\nint sumEven(const std::vector<int>& v) {\n    int total = 0;\n    for (size_t i = 0; i < v.size(); ++i) {\n        if (v[i] % 2 == 0) total += v[i];\n    }\n    return total;\n}"),
    ("php", "function greet($name) {\n    if (empty($name)) {\n        return 'Hello, guest!';\n    }\n    return 'Hello, ' . ucfirst($name) . '!';\n}"),
    ("sql", "SELECT department, COUNT(*) AS staff, AVG(salary) AS avg_salary\nFROM employees\nWHERE hired_on > '2020-01-01'\nGROUP BY department\nORDER BY avg_salary DESC;"),
    ("bash", "#!/bin/bash\nset -e\nBACKUP=/backups/$(date +%F)\nmkdir -p $BACKUP\ncp -r ~/projects $BACKUP\necho \"backup done: $BACKUP\""),
]
SNIPPET_ASKS_2 = {
    "code_explain": [
        "I'm new to {lang}. Could you walk me through this?\n\n```{lang}\n{code}\n```",
        "what is this doing exactly\n\n```{lang}\n{code}\n```",
        "A coworker wrote this and left. Can you tell me what it does and if anything looks risky?\n\n```{lang}\n{code}\n```",
    ],
    "code_refactor": [
        "Can you make this shorter without changing what it does?\n\n```{lang}\n{code}\n```",
        "This works but it looks messy to me. How would an experienced {lang} developer write it?\n\n```{lang}\n{code}\n```",
        "Rewrite this with early returns and better names:\n\n```{lang}\n{code}\n```",
        "```{lang}\n{code}\n```\nany way to make this cleaner?",
    ],
    "code_test": [
        "I need tests for this before I change it. What would you cover?\n\n```{lang}\n{code}\n```",
        "Write a few unit tests for this {lang} code, with one failing case I should expect:\n\n```{lang}\n{code}\n```",
    ],
    "copy_edit": [
        "Add comments explaining each step but don't touch the code itself:\n\n```{lang}\n{code}\n```",
        "Give this function a `verbose` argument that prints what it is doing. Return the whole function.\n\n```{lang}\n{code}\n```",
        "Please change every variable name to be more descriptive and send the complete code back:\n\n```{lang}\n{code}\n```",
    ],
    "code_fix": [
        "This {lang} code doesn't do what I expect. Can you help me debug it?\n\n```{lang}\n{code}\n```",
        "Can you review this for bugs? It's going to production tomorrow.\n\n```{lang}\n{code}\n```",
        "```{lang}\n{code}\n```\nthe output is wrong and I can't see why",
    ],
}
OPENINGS_2 = ["", "", "", "Hi! ", "hey, ", "Quick question. ", "Sorry if this is basic. ",
              "Hello, ", "Can you help? "]
CLOSINGS_2 = ["", "", "", "\n\nThanks!", "\n\nI'm a beginner, so please explain simply.",
              "\n\nThis is for a school project.", "\n\nWe use this at work.",
              "\n\nKeep it short please.", "\n\nthanks in advance", " ty"]
# code_test without pasted code: (language, test framework).
TEST_FRAMEWORKS = [
    ("Python", "pytest"), ("Python", "unittest"), ("JavaScript", "Jest"), ("TypeScript", "Vitest"),
    ("Go", "table-driven Go"), ("Rust", "Rust unit"), ("Java", "JUnit 5"), ("C#", "xUnit"),
    ("Ruby", "RSpec"),
]
DESCRIBED_TESTS = [
    "Write {fw} tests for a {lang} function that {task}.",
    "I wrote a {lang} function that {task}. Can you give me {fw} tests for it, edge cases included?",
    "What should I test in a {lang} function that {task}? Write the tests with {fw}.",
]


# Version 2's copy_edit requests beyond Python code: files and text people
# paste with an edit that is specific to them, answered by copying most of it.
EDITS_2 = [
    ("yaml", "services:\n  web:\n    image: shop/web:1.4\n    ports:\n      - \"8000:8000\"\n    environment:\n      - LOG_LEVEL=info\n  worker:\n    image: shop/worker:1.4\n    replicas: 1",
     ["Bump both images to version 1.5 and set the worker's replicas to 3. Send the whole file back.",
      "Add a redis service (image redis:7) and make web depend on it. Full file please."]),
    ("json", "{\n  \"name\": \"notes-app\",\n  \"version\": \"0.3.0\",\n  \"scripts\": {\n    \"start\": \"node server.js\",\n    \"test\": \"jest\"\n  },\n  \"dependencies\": {\n    \"express\": \"^4.18.2\"\n  }\n}",
     ["Add a lint script that runs eslint and bump the version to 0.4.0. Return the complete package.json.",
      "Add dotenv as a dependency and a dev script using nodemon, then show me the full file."]),
    ("toml", "[project]\nname = \"weather-cli\"\nversion = \"0.1.0\"\ndependencies = [\"requests\", \"click\"]\n\n[project.scripts]\nweather = \"weather_cli.main:cli\"",
     ["Add rich to the dependencies and a requires-python of >=3.10. Give me the whole pyproject back.",
      "Rename the command from weather to wx, keep everything else. Full file."]),
    ("dockerfile", "FROM python:3.11\nWORKDIR /app\nCOPY . .\nRUN pip install -r requirements.txt\nCMD python app.py",
     ["Use python:3.12-slim, copy requirements.txt first so the pip layer is cached, and run as a non-root user. Full Dockerfile please.",
      "Add an EXPOSE for port 5000 and a HEALTHCHECK. Return the complete Dockerfile."]),
    ("html", "<nav>\n  <ul>\n    <li><a href=\"/\">Home</a></li>\n    <li><a href=\"/blog\">Blog</a></li>\n    <li><a href=\"/about\">About</a></li>\n  </ul>\n</nav>",
     ["Add a Contact link at the end and mark Blog as the current page. Give me the full markup back.",
      "Add aria attributes so screen readers announce this as the main navigation. Return all of it."]),
    ("css", ".card {\n  border: 1px solid #ddd;\n  padding: 10px;\n  margin: 10px;\n  border-radius: 4px;\n}\n.card h2 {\n  font-size: 18px;\n  color: #333;\n}",
     ["Convert the pixel sizes to rem (16px = 1rem) and return the whole stylesheet.",
      "Add a dark-mode version of these rules with prefers-color-scheme. Full CSS please."]),
    ("sql", "CREATE TABLE orders (\n  id INTEGER PRIMARY KEY,\n  customer_id INTEGER,\n  total REAL,\n  created TEXT\n);",
     ["Make customer_id a foreign key to customers(id), total NOT NULL, and created default to the current time. Return the full statement.",
      "Add a status column that can only be 'open', 'paid' or 'shipped'. Show the whole CREATE TABLE."]),
    ("javascript", "function formatPrice(cents) {\n  var euros = Math.floor(cents / 100);\n  var rest = cents % 100;\n  return euros + ',' + (rest < 10 ? '0' + rest : rest) + ' EUR';\n}",
     ["Change var to const or let as appropriate and use a template string. Full function please.",
      "Add a JSDoc comment to this function and keep the code exactly as is."]),
    ("text", "hi team, quick update on the launch. we are behind on the payment integration, its about a week late because the provider changed there API. everything else is on track, design is done and QA starts monday. let me know if you have questions",
     ["Fix the grammar and capitalization of this message but keep my wording.",
      "Make this update sound more professional, same content, and give me the whole message."]),
    ("text", "Our cafe will be closed on Monday 3rd for a private event. We will reopen on tuesday at the usual time of 8am. Sorry for any inconvience and thank you for you're understanding!",
     ["Correct the spelling mistakes in this notice and return it otherwise unchanged.",
      "Rewrite this notice in a warmer, friendlier tone. Keep all the facts."]),
    ("markdown", "## Installation\n\nclone the repo and run npm install. then copy .env.example to .env and fill in your keys. run npm start and open localhost:3000",
     ["Turn this into numbered steps with code blocks for the commands. Return the whole section.",
      "Clean up this README section (capitalization, punctuation) without changing the steps."]),
]
# Version 2's tool_use harnesses beyond coding agents, each with requests,
# the call one would answer with, and what the tool sends back.
TOOL_SETS_2 = [
    (
        "You are a smart-home assistant. Use the tools to control the house and keep answers short.",
        [("set_light", "Turn a light on or off or dim it.", {"room": "string", "level": "number"}),
         ("set_thermostat", "Set the target temperature in Celsius.", {"celsius": "number"}),
         ("play_music", "Play a song, artist or playlist.", {"query": "string"})],
        [("dim the living room lights to 30 percent", "set_light", {"room": "living room", "level": 30}, '{"room": "living room", "level": 30, "ok": true}'),
         ("it's cold in here, make it 22 degrees", "set_thermostat", {"celsius": 22}, '{"target": 22, "current": 18.5}'),
         ("put on some jazz for dinner", "play_music", {"query": "dinner jazz"}, '{"playing": "Dinner Jazz Classics", "tracks": 48}'),
         ("Turn off the bedroom light please.", "set_light", {"room": "bedroom", "level": 0}, '{"room": "bedroom", "level": 0, "ok": true}')],
    ),
    (
        "You are a support agent for an online bookshop. Look things up before answering and be polite.",
        [("find_order", "Look up an order by its number.", {"order_id": "string"}),
         ("track_parcel", "Where a parcel is now.", {"tracking": "string"}),
         ("refund", "Refund an order (needs a reason).", {"order_id": "string", "reason": "string"})],
        [("Where is my order 88213? It was supposed to arrive yesterday.", "find_order", {"order_id": "88213"}, '{"order_id": "88213", "status": "shipped", "tracking": "DX99012", "items": 2}'),
         ("I got the wrong book in order 77120 and want my money back", "refund", {"order_id": "77120", "reason": "wrong item"}, '{"refund_id": "R-5531", "amount": 18.9, "status": "pending"}'),
         ("can you tell me where parcel DX44120 is", "track_parcel", {"tracking": "DX44120"}, '{"location": "Leipzig hub", "eta": "2 days"}')],
    ),
    (
        "You are a data assistant with read access to the company's analytics database. Write SQL with the query tool and explain results in plain words.",
        [("query", "Run a read-only SQL query.", {"sql": "string"}),
         ("list_tables", "List the tables and their columns.", {"schema": "string"})],
        [("How many new signups did we get last week?", "query", {"sql": "SELECT COUNT(*) FROM signups WHERE created >= date('now', '-7 day')"}, '[{"count": 1342}]'),
         ("Which tables do we have for billing?", "list_tables", {"schema": "billing"}, '{"invoices": ["id", "customer_id", "amount", "due"], "payments": ["id", "invoice_id", "paid_at"]}'),
         ("what were our top 3 products by revenue in March", "query", {"sql": "SELECT product, SUM(amount) AS revenue FROM sales WHERE month = 3 GROUP BY product ORDER BY revenue DESC LIMIT 3"}, '[{"product": "Pro plan", "revenue": 48200}, {"product": "Team plan", "revenue": 31900}, {"product": "Add-on storage", "revenue": 7400}]')],
    ),
    (
        "You are a calendar and email assistant for a busy manager. Use the tools, confirm what you did in one sentence.",
        [("list_events", "Events on a day.", {"date": "string"}),
         ("create_event", "Add an event.", {"title": "string", "start": "string", "minutes": "number"}),
         ("send_email", "Send an email.", {"to": "string", "subject": "string", "body": "string"})],
        [("What's on my calendar tomorrow?", "list_events", {"date": "tomorrow"}, '[{"title": "1:1 with Sam", "start": "09:30"}, {"title": "Budget review", "start": "14:00"}]'),
         ("Book 45 minutes with the design team on Thursday at 3pm", "create_event", {"title": "Design sync", "start": "Thursday 15:00", "minutes": 45}, '{"id": "ev_7781", "created": true}'),
         ("email Priya that the report will be a day late", "send_email", {"to": "priya", "subject": "Report timing", "body": "The report will be one day late."}, '{"sent": true}')],
    ),
]


@lru_cache(maxsize=None)
def stdlib_snippets() -> List[str]:
    """Top-level functions (4-40 lines) of the training share of stdlib files."""
    out = []
    for rel in stdlib_files("train"):
        src = _read(rel)
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        lines = src.split("\n")
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and 4 <= node.end_lineno - node.lineno < 40:
                out.append("\n".join(lines[node.lineno - 1 : node.end_lineno]))
    return out


@lru_cache(maxsize=None)
def _file_names() -> List[tuple]:
    """(path, top-level function name) pairs of the training share."""
    out = []
    for rel in stdlib_files("train"):
        try:
            tree = ast.parse(_read(rel))
        except SyntaxError:
            continue
        out += [(rel, n.name) for n in tree.body if isinstance(n, ast.FunctionDef)]
    return out


def _user(text: str) -> list:
    return [{"role": "user", "content": text}]


def _snippet_prompt(rng, category, pc=None):
    """A request about a pasted snippet; version 2's pieces (`pc.snippets`)
    draw it from their own snippets and asks too, and put some test requests
    as a described function (version 1's draws are unchanged)."""
    wide = pc is not None and bool(pc.snippets)
    if wide and category == "code_test" and rng.random() < 0.35:
        lang, fw = rng.choice(TEST_FRAMEWORKS)
        ask = rng.choice(DESCRIBED_TESTS).format(lang=lang, fw=fw, task=rng.choice(pc.tasks))
        return _framed(rng, ask)
    r = rng.random()
    if not wide:
        if r < 0.8 or category in ("copy_edit",):
            lang, code = "python", rng.choice(stdlib_snippets())
        else:
            lang, code = rng.choice(OTHER_SNIPPETS)
    else:  # copy_edit's asks (type hints, PEP 8, f-strings) are Python's
        own = [x for x in pc.snippets if category != "copy_edit" or x[0] == "python"]
        if r < 0.3:
            lang, code = "python", rng.choice(stdlib_snippets())
        elif r < 0.85 or category == "copy_edit":
            lang, code = rng.choice(own)
        else:
            lang, code = rng.choice(OTHER_SNIPPETS)
    if category == "code_fix":
        hits = [(p, r) for p, r in MUTATIONS if re.search(p, code)]
        if hits:
            p, r = rng.choice(hits)
            matches = list(re.finditer(p, code))
            m = rng.choice(matches)
            code = code[: m.start()] + re.sub(p, r, m.group(0)) + code[m.end() :]
    asks = SNIPPET_ASKS[category] + (pc.snippet_asks[category] if wide else [])
    text = rng.choice(asks).format(lang=lang, code=code, new="process_" + rng.choice(ITEMS))
    return _framed(rng, text) if wide else text


def _framed(rng, text: str) -> str:
    """Version 2's requests as people open and close them (a greeting, a
    word about themselves or the project, thanks), which also multiplies the
    distinct prompts a few dozen snippets make."""
    return rng.choice(OPENINGS_2) + text + rng.choice(CLOSINGS_2)


@dataclass(frozen=True)
class Pieces:
    """What `natural_prompts` composes from (see PIECES)."""

    tasks: Sequence[str]
    write: Sequence[str]
    chat: Sequence[str]
    who: Sequence[str]
    writing: Sequence[str]
    writing_about: Sequence[str]
    math: Sequence[str]
    concepts: Sequence[str] = ()  # code_explain without pasted code
    inline: Sequence[tuple] = ()  # (language, one line of code) to explain
    snippets: Sequence[tuple] = ()  # (language, code) of snippet requests besides stdlib's
    snippet_asks: Optional[Dict[str, List[str]]] = None  # more asks a snippet category
    edits: Sequence[tuple] = ()  # copy_edit: (kind, text, asks) besides code snippets
    tool_sets: Sequence[tuple] = ()  # tool_use: (preamble, tools, turns) besides HARNESSES
    free_share: float = 0.0  # share of each category's requests drawn from free_files
    free_files: Sequence[str] = ()  # files of free-form requests, in this directory


# 1: what stages 3-5 of the default drafter were trained on; 2: those and the
# pieces added in the twenty-second session (stage 6); 3: those and version 3's
# math and chat (twenty-fourth session).
PIECES = {
    1: Pieces(TASKS, WRITE, CHAT, WHO, WRITING, WRITING_ABOUT, MATH),
    2: Pieces(
        TASKS + TASKS_2, WRITE + WRITE_2, CHAT + CHAT_2, WHO + WHO_2,
        WRITING + WRITING_2, WRITING_ABOUT + WRITING_ABOUT_2, MATH + MATH_2,
        CONCEPTS, INLINE, SNIPPETS_2, SNIPPET_ASKS_2, EDITS_2, TOOL_SETS_2,
    ),
}
PIECES[3] = replace(PIECES[2], chat=PIECES[2].chat + CHAT_3, math=PIECES[2].math + MATH_3)
FREE_FORM = Path(__file__).with_name("natural_free.json")
FREE_FORM_2 = Path(__file__).with_name("natural_free_2.json")
FREE_FORM_3 = Path(__file__).with_name("natural_free_3.json")
# 4: version 3 and, for a third of each category, the free-form requests.
PIECES[4] = replace(PIECES[3], free_share=0.35, free_files=(FREE_FORM.name,))
# 5: stage 9 (version 4) gained most on the free-form requests, which read like people's:
# a second set of them, written apart from the first, and 60% of each category drawn there.
PIECES[5] = replace(PIECES[4], free_share=0.6, free_files=(FREE_FORM.name, FREE_FORM_2.name))
# 6: stages 9-11 each drew the same 3,202 free-form requests again: a third set, written
# apart from the others, and 70% of each category drawn from the three.
PIECES[6] = replace(
    PIECES[5], free_share=0.7, free_files=(FREE_FORM.name, FREE_FORM_2.name, FREE_FORM_3.name)
)


@lru_cache(maxsize=None)
def free_form(files: tuple = (FREE_FORM.name,)) -> Dict[str, tuple]:
    """The free-form requests of `files` by category: (kind, messages) pairs,
    the kind ("coding" or "general") telling tool_use turns which harness to get."""
    out: Dict[str, list] = {}
    for name in files:
        for item in json.loads(FREE_FORM.with_name(name).read_text()):
            out.setdefault(item["category"], []).append((item.get("kind") or "", item["messages"]))
    return {k: tuple(v) for k, v in out.items()}


def _free(rng, category: str, files: tuple = (FREE_FORM.name,)) -> list:
    """A free-form request of `category`, its first message opened and closed
    as people do (`_framed`); a tool_use one after a system prompt with tools
    (an agent harness of the training share, or a non-coding one)."""
    kind, msgs = rng.choice(free_form(tuple(files))[category])
    msgs = [dict(m) for m in msgs]
    msgs[0]["content"] = _framed(rng, msgs[0]["content"])
    if category == "tool_use":
        if kind == "general":
            preamble, specs, _ = rng.choice(TOOL_SETS_2)
            tools = [_tool(name, doc, **params) for name, doc, params in specs]
        else:
            preamble, tools = rng.choice(HARNESSES["train"])
        msgs.insert(0, {"role": "system", "content": system_prompt(preamble, tools)})
    return msgs


def _explain(rng, pc: Pieces):
    """A code_explain request: pasted code, or (version 2) a concept or a line."""
    if pc.concepts and rng.random() < 0.4:
        if rng.random() < 0.6:
            return rng.choice(pc.concepts)
        lang, code = rng.choice(pc.inline)
        return rng.choice(INLINE_ASKS).format(lang=lang, code=code)
    return _snippet_prompt(rng, "code_explain", pc)


def _math(rng, pc: Pieces):
    a, b, c = rng.randint(2, 12), rng.randint(2, 20), rng.randint(1, 9)
    template = rng.choice(pc.math)
    # Version 3's templates also take a sequence's terms and a factorable
    # quadratic's sum and product; the draw above is unchanged, so versions 1
    # and 2 compose what they always did.
    extra = {}
    if "{a2}" in template:
        d = rng.randint(2, 9)
        extra = dict(a2=a + d, a3=a + 2 * d, a4=a + 3 * d)
    if "{s}" in template:
        r1, r2 = rng.randint(1, 9), rng.randint(1, 9)
        extra = dict(s=r1 + r2, m=r1 * r2)
    text = template.format(
        n1=rng.choice(NAMES), n2=rng.choice(NAMES), item=rng.choice(ITEMS),
        a=a, b=b, c=c, p=rng.randint(2, 15), bill=rng.choice([20, 50, 100]),
        big=rng.randint(40, 400), p2=rng.randint(40, 400), **extra,
    )
    return text + rng.choice(MATH_STYLE)


def _tool_use(rng, pc: Pieces):
    if pc.tool_sets and rng.random() < 0.2:
        return _tool_set_turn(rng, rng.choice(pc.tool_sets))
    preamble, tools = rng.choice(HARNESSES["train"])
    msgs = [{"role": "system", "content": system_prompt(preamble, tools)}]
    if rng.random() < 0.3:
        ask = rng.choice(TOOL_ASKS)
    else:
        path, name = rng.choice(_file_names())
        ask = rng.choice(TOOL_FILE_ASKS).format(path=path, name=name)
    msgs.append({"role": "user", "content": ask})
    if rng.random() < 0.5:  # a turn later: the tool has answered
        name = tools[2]["name"]
        arg = next(iter(tools[2]["parameters"]["properties"]))
        call = '{"name": "%s", "arguments": {"%s": "..."}}' % (name, arg)
        msgs.append({"role": "assistant", "content": f"<tool_call>{call}</tool_call>"})
        msgs.append({"role": "tool", "content": rng.choice(TOOL_RESULTS)})
    return msgs


def _tool_set_turn(rng, tool_set):
    """A request to one of version 2's harnesses; half of them a turn later,
    the call made and the tool's answer back."""
    preamble, specs, turns = tool_set
    tools = [_tool(name, doc, **params) for name, doc, params in specs]
    ask, name, args, result = rng.choice(turns)
    msgs = [
        {"role": "system", "content": system_prompt(preamble, tools)},
        {"role": "user", "content": _framed(rng, ask)},
    ]
    if rng.random() < 0.5:
        call = json.dumps({"name": name, "arguments": args})
        msgs.append({"role": "assistant", "content": f"<tool_call>{call}</tool_call>"})
        msgs.append({"role": "tool", "content": result})
    return msgs


def _chat(rng, pc: Pieces):
    r = rng.random()
    if r < 0.4:
        q = rng.choice(pc.chat)
        return _user(rng.choice(CHAT_ABOUT).format(q=q, who=rng.choice(pc.who)))
    if r < 0.7:
        what, about = rng.choice(pc.writing), rng.choice(pc.writing_about)
        return _user(f"Write {what} {about}.{rng.choice(TONES)}")
    first, reply = rng.choice(FIRST_TURNS)
    return [
        {"role": "user", "content": first},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": rng.choice(FOLLOW_UPS)},
    ]


# The recipe's mix of the natural set (shares of its prompts).
DEFAULT_MIX = {
    "code_write": 0.18, "code_fix": 0.1, "code_explain": 0.1, "code_refactor": 0.08,
    "code_test": 0.08, "copy_edit": 0.14, "chat": 0.14, "math": 0.1, "tool_use": 0.08,
}


def natural_prompts(
    n: int, *, seed: int = 0, mix: Dict[str, float] = DEFAULT_MIX, pieces: int = 1
) -> List[Prompt]:
    """`n` distinct natural prompts drawn by category shares `mix` (seeded),
    composed from version `pieces` of the hand-written pieces (PIECES)."""
    if pieces not in PIECES:
        raise ValueError(f"pieces {pieces}: one of {sorted(PIECES)}")
    pc = PIECES[pieces]
    rng = random.Random(seed)
    cats, weights = list(mix), list(mix.values())
    out, seen = [], set()
    for _ in range(n * 20):
        if len(out) >= n:
            break
        cat = rng.choices(cats, weights)[0]
        # Only versions 4-6 draw here, so versions 1-3 compose what they always did.
        if pc.free_share and rng.random() < pc.free_share:
            msgs = _free(rng, cat, pc.free_files)
        elif cat == "code_write":
            msgs = _user(rng.choice(pc.write).format(lang=rng.choice(LANGUAGES), task=rng.choice(pc.tasks)))
        elif cat == "code_explain":
            msgs = _user(_explain(rng, pc))
        elif cat == "copy_edit" and pc.edits and rng.random() < 0.2:
            kind, text, asks = rng.choice(pc.edits)
            fence = "\n\n" + text if kind == "text" else f"\n\n```{kind}\n{text}\n```"
            msgs = _user(_framed(rng, rng.choice(asks) + fence))
        elif cat in SNIPPET_ASKS:
            msgs = _user(_snippet_prompt(rng, cat, pc))
        elif cat == "math":
            msgs = _user(_math(rng, pc))
        elif cat == "tool_use":
            msgs = _tool_use(rng, pc)
        else:
            msgs = _chat(rng, pc)
        key = tuple((m["role"], m["content"]) for m in msgs)
        if key not in seen:
            seen.add(key)
            out.append(Prompt(msgs[-1]["content"], cat, msgs))
    return out


def long_prompts(tokenizer, n: int, *, seed: int = 0, lengths=(1024, 7552)) -> List[Prompt]:
    """`n` agent transcripts (training share) of about `lengths` tokens, drawn
    uniformly (estimated lengths, which overestimate: keep MAX + the response
    within the target's context)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        n_tok = rng.randint(*lengths)
        msgs = transcript(tokenizer, n_tok, seed * 100_003 + i, split="train", exact=False)
        out.append(Prompt(msgs[-1]["content"], "long", msgs))
    return out


def _words(prompt: Prompt) -> List[str]:
    msgs = prompt.messages or _user(prompt.text)
    return " ".join(m["content"] for m in msgs if m["role"] != "system").split()


def shared_spans(train: Sequence[Prompt], held: Sequence[Prompt], n: int = 10) -> List[int]:
    """Indices of `held` prompts sharing a run of `n` words with a training one
    (system prompts aside: a harness is shared by design only within a split)."""
    grams = set()
    for p in train:
        w = _words(p)
        grams.update(tuple(w[i : i + n]) for i in range(len(w) - n + 1))
    hits = []
    for j, p in enumerate(held):
        w = _words(p)
        if any(tuple(w[i : i + n]) in grams for i in range(len(w) - n + 1)):
            hits.append(j)
    return hits
